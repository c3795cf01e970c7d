"""Stop signals: the first SIGTERM/SIGINT is a request checked at safe points, a second one exits at once."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from seed_jax.infra import stop


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_is_a_request(sig):
  before = signal.getsignal(sig)
  with stop.StopSignals() as s:
    s.check()
    os.kill(os.getpid(), sig)
    assert s.requested == sig.name
    with pytest.raises(stop.StopRequested, match=f"stop requested by {sig.name}"):
      s.check()
  assert signal.getsignal(sig) is before


def test_second_signal_exits_at_once_with_one_line():
  code = textwrap.dedent("""
      import os, signal, time
      from seed_jax.infra.stop import StopSignals
      with StopSignals():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
      print("not reached")
  """)
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert proc.returncode == 128 + signal.SIGINT
  assert "not reached" not in proc.stdout and "Traceback" not in proc.stderr
  assert proc.stderr.splitlines() == [
      "seed_jax: SIGINT received: stopping at the next safe point (again to exit now)",
      "seed_jax: second SIGINT: exiting now, without a checkpoint of the current update"]
