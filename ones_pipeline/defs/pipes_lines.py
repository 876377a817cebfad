"""A Pipes message reader that hands Dagster only whole lines: ``WholeLineMessageReader``.

The training step's launcher (``dagster_pipes``' file message writer) appends one JSON line per message to a
file; Dagster's file readers (``dg.PipesFileMessageReader``, and ``dg.PipesTempFileMessageReader`` that
``dg.PipesSubprocessClient`` uses by default) tail it with ``readline`` and parse whatever comes back. A read that
lands in the middle of a write returns the line's first part without its newline; parsing it fails, the
reader's thread ends, every later message of the run is lost (its "closed" too), and the step fails though the
training ended well: seen once live (a job's run failed with "Unterminated string" and was relaunched, its
finished training redone). This reader keeps a partial line until its newline arrives. Public Dagster API only
(``dg.PipesMessageReader``); the writer side is unchanged.
"""

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from dagster_pipes import PipesDefaultMessageWriter

POLL_S = 0.01  # how often the file is looked at when nothing new is there


class WholeLineMessageReader(dg.PipesMessageReader):
    """Read the Pipes messages the external process appends to ``path`` (a temporary file when None), one
    JSON object per line, each handled once its line is whole. ``cleanup``: delete ``path`` after the session."""

    def __init__(self, path: str | None = None, cleanup: bool = True) -> None:
        self._path = path
        self._cleanup = cleanup

    @contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        with tempfile.TemporaryDirectory() as tmp:
            path = self._path or os.path.join(tmp, "messages.jsonl")
            open(path, "w", encoding="utf-8").close()
            done = threading.Event()
            thread = threading.Thread(target=self._read, args=(path, handler, done), daemon=True)
            thread.start()
            try:
                yield {PipesDefaultMessageWriter.FILE_PATH_KEY: path,
                       PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: False}
            finally:
                done.set()
                thread.join()
                if self._path is not None and self._cleanup and os.path.exists(path):
                    os.remove(path)

    @staticmethod
    def _read(path: str, handler, done: threading.Event) -> None:
        try:
            with open(path, encoding="utf-8") as f:
                partial = ""
                while True:
                    piece = f.readline()
                    if piece:
                        partial += piece
                        if partial.endswith("\n"):
                            if partial.strip():
                                handler.handle_message(json.loads(partial))
                            partial = ""
                    elif done.is_set():  # the session is over and everything written has been read
                        break
                    else:
                        time.sleep(POLL_S)
        except Exception:  # as Dagster's own readers do: the session reports it on the step
            handler.report_pipes_framework_exception(f"{WholeLineMessageReader.__name__} read thread", sys.exc_info())

    def no_messages_debug_text(self) -> str:
        where = self._path or "a temporary file"
        return f"Tried to read messages from {where}: the external process's dagster_pipes file message writer."
