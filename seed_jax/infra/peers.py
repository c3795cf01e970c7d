"""One failing process stops all. A fatal error on one process of a multi-process run is posted to JAX's
coordination service (its key-value store, which lives in process 0); a watcher thread on every process reads
the store every POLL_S and ends its process with the same line, so the whole job exits non-zero within seconds
instead of leaving the others waiting in a collective until the heartbeat timeout. Every process that ends this
way acknowledges and waits (at most ACK_WAIT_S) until every process has, so none leaves (the failing one
included) before all have read the line; process 0, whose end ends the service, leaves last.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import socket
import sys
import threading
import time
from typing import NoReturn

import jax

log = logging.getLogger(__name__)

FATAL, ACK = "seed_jax/fatal/", "seed_jax/fatal_ack/"
FIRST = FATAL + "first"  # set once (no overwrite): when several processes fail at once, one line for all
POLL_S, ACK_WAIT_S = 0.5, 10.0
_lock = threading.Lock()  # one exit per process: the main thread's or the watcher's
_watching: list = []  # the client the watcher reads, once started
_done = threading.Event()  # set at interpreter exit: the watcher leaves the client before JAX shuts it down


def _client():
  """The client JAX joined the job with (no public accessor); None where a JAX version moved it (then an error
  ends only its own process, and the others at the heartbeat timeout, as without this module)."""
  try:
    from jax._src import distributed
  except ImportError:
    return None
  return getattr(getattr(distributed, "global_state", None), "client", None)


def where() -> str:
  """This process in words: "process 1 of 2 (host-a)"."""
  return f"process {jax.process_index()} of {jax.process_count()} ({socket.gethostname()})"


def start_watcher() -> None:
  """Starts the watcher on a multi-process run (once; after jax.distributed.initialize)."""
  client = _client()
  if _watching or jax.process_count() == 1 or client is None:
    return
  _watching.append(client)
  thread = threading.Thread(target=_watch, args=(client, jax.process_index(), jax.process_count()), daemon=True,
                            name="seed_jax-peers")
  thread.start()
  # Runs before JAX's own exit hook (registered at its import; atexit runs the last registered first): a read
  # still in flight while the backend and the coordination service are torn down can abort the process.
  atexit.register(_stop_watching, thread)


def _stop_watching(thread: threading.Thread) -> None:
  _done.set()
  thread.join(timeout=POLL_S + 5.0)


def fail_all(kind: str, message: str) -> NoReturn:
  """Ends this process with the line "<kind>: <message>" on stderr and status 1; on a multi-process run the
  line names this process ("<kind>: process 1 of 2 (host): <message>") and every other process ends with it
  too. When another process has already posted its error, that one is the cause and its line is used (this
  process's error is then a consequence, e.g. a collective whose peer left)."""
  if not _watching:
    sys.exit(f"{kind}: {message}")
  client, me = _watching[0], jax.process_index()
  line = f"{kind}: {where()}: {message}"
  first = _posted(client, me)
  if first is None:
    try:
      client.key_value_set(FIRST, f"{me}\t{line}")
    except Exception as e:  # posted meanwhile by another process (its line wins), or the store is gone
      first = _posted(client, me)
      if first is None:
        log.warning("could not post the error to the other processes: %s", e)
  _exit(client, me, jax.process_count(), line if first is None else first)


def fatal_message(e: BaseException, first_line: str) -> str:
  """The message of an unexpected error; a collective whose peer vanished says so (the peer's own log has the
  cause: it ended without posting one, e.g. killed or out of memory)."""
  msg = f"{type(e).__name__}: {first_line}"
  if _PEER_GONE.search(msg):
    return f"another process left the job without a word (its own log says why); here: {msg}"
  return msg


_PEER_GONE = re.compile(r"Connection (reset|closed) by peer|Gloo \w+ failed")


def posted_elsewhere() -> bool:
  """Whether another process has posted a fatal error (this process's own error is then likely its effect)."""
  return bool(_watching) and _posted(_watching[0], jax.process_index()) is not None


def _posted(client, me: int) -> str | None:
  """The line another process posted first, or None (also when the store is gone)."""
  try:
    return _other(client.key_value_dir_get(FATAL), me)
  except Exception:
    return None


def _other(posted: list[tuple[str, str]], me: int) -> str | None:
  p, _, line = (posted[0][1] if posted else "").partition("\t")
  return line if posted and int(p) != me else None


def _watch(client, me: int, n: int) -> None:
  while not _done.wait(POLL_S):
    try:
      line = _other(client.key_value_dir_get(FATAL), me)
    except Exception:  # the store is gone: the job is ending (or process 0 died; JAX's heartbeat handles that)
      return
    if line is not None:
      _exit(client, me, n, line)


def _exit(client, me: int, n: int, line: str) -> NoReturn:
  with _lock:  # the other thread, arriving here too, blocks until the process is gone
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)
    # The line stays the last one: errors that follow from the others leaving (a collective whose peer closed,
    # JAX's abort when the service goes) are consequences, not news.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
      client.key_value_set(f"{ACK}{me}", "1", allow_overwrite=True)
      deadline = time.monotonic() + ACK_WAIT_S
      while len(client.key_value_dir_get(ACK)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
      if me == 0:  # the service ends with this process, and JAX aborts a process still attached to it
        time.sleep(0.5)
    except Exception:  # process 0 has ended, taking the store with it
      pass
    os._exit(1)  # not sys.exit: jax.distributed's shutdown barrier would wait for processes that are leaving
