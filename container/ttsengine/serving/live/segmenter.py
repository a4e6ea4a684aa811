"""Text arriving in pieces -> segments to speak: cut at a sentence end (followed by white space, so "3.5" split
across two pieces stays whole; CJK enders and line breaks cut at once), at a length cap (at the last space or
comma before it when there is one), and at an explicit flush. What is left waits for more text.
"""

from __future__ import annotations

import re

# a sentence end: . ! ? ; or … (with closing quotes/brackets) followed by white space; a CJK ender; a line break
_END = re.compile(r"[.!?;…]+[\"'”’)\]]*\s|[。！？；]+[”’」』）]*|\n")
_SOFT = re.compile(r"[\s,，、:：]")  # where a capped segment may be cut


class Segmenter:
    def __init__(self, cap: int):
        self.cap = max(1, cap)
        self._buf = ""

    @property
    def pending(self) -> str:
        return self._buf

    def feed(self, text: str) -> list[str]:
        """Adds text; -> the segments it completed (stripped, empty ones dropped), in order."""
        self._buf += text
        out = []
        while True:
            cut = self._cut()
            if cut is None:
                break
            segment, self._buf = self._buf[:cut], self._buf[cut:]
            if segment.strip():
                out.append(segment.strip())
        return out

    def flush(self) -> list[str]:
        """Everything pending, as segments (capped as feed caps them)."""
        out = self.feed("")
        rest, self._buf = self._buf.strip(), ""
        return [*out, rest] if rest else out

    def _cut(self) -> int | None:
        """The end of the next complete segment in the buffer, or None."""
        m = _END.search(self._buf)
        if m is not None and m.end() <= self.cap:
            return m.end()
        if len(self._buf) <= self.cap:
            return None
        head = self._buf[:self.cap]
        soft = [s.end() for s in _SOFT.finditer(head) if s.start() > 0]
        return soft[-1] if soft else self.cap
