"""Progress of a long run (``fusedmoe bench``, ``fusedmoe tune``) on stderr."""
from __future__ import annotations

import sys
import time
from typing import Optional

__all__ = ["Progress"]


class Progress:
    """Progress on stderr: a tqdm bar on a terminal (when tqdm is importable; else one line
    rewritten in place), a plain line at most every 5 s otherwise. ``total`` may grow."""

    def __init__(self, total: Optional[int] = None, desc: str = "", enabled: bool = True, stream=None):
        self.enabled, self.desc, self.total, self.n = enabled, desc, total or 0, 0
        self.stream = stream or sys.stderr
        self._bar = None
        self._t0 = time.perf_counter()
        self._last = 0.0
        # tqdm on a terminal; in a log file its redraws would be noise: plain lines every 5 s there
        if enabled and getattr(self.stream, "isatty", lambda: False)():
            try:
                from tqdm import tqdm  # noqa: PLC0415 (optional)
                self._bar = tqdm(total=self.total or None, desc=desc, file=self.stream, dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def add_total(self, n: int) -> None:
        self.total += n
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.refresh()

    def update(self, n: int = 1, postfix: str = "") -> None:
        self.n += n
        if not self.enabled:
            return
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(n)
            return
        now = time.perf_counter()
        tty = getattr(self.stream, "isatty", lambda: False)()
        if not tty and now - self._last < 5.0 and self.n != self.total:
            return
        self._last = now
        tot = f"/{self.total}" if self.total else ""
        line = f"{self.desc}: {self.n}{tot} [{now - self._t0:.0f}s] {postfix}"
        self.stream.write(("\r" + line.ljust(100)) if tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        elif getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\n")
            self.stream.flush()

    def write(self, msg: str) -> None:
        if self._bar is not None:
            self._bar.write(msg)
        else:
            print(msg, file=self.stream, flush=True)
