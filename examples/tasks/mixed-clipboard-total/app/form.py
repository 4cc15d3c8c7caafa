"""ALE Form: a one-field form that runs inside an xterm (the mixed-clipboard-total demo task).

    python3 form.py OUTPUT_JSON READY_FILE DRAFT_FILE

It puts its terminal in raw mode and turns on xterm's bracketed-paste mode, so it can tell text
pasted from a selection (wrapped in ESC[200~ ... ESC[201~ by xterm) from text typed key by key.
Enter submits: the field is written to OUTPUT_JSON (atomically) as
``{"value": ..., "pasted_chars": N, "typed_chars": M}`` and the field is cleared. Backspace
deletes, Ctrl+Q quits. Once the terminal is in raw mode it writes its pid to READY_FILE. The field's
current text is kept in DRAFT_FILE (rewritten on every change), so a script can tell when a paste,
which xterm delivers asynchronously, has landed before it presses Enter.

Runs on the sandbox's own python3 and uses the standard library only.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
import termios
import tty

TITLE = "ALE Form"
PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"
CTRL_Q = "\x11"


def skip_escape(text: str, i: int) -> int | None:
    """Index just past the escape sequence at ``text[i]``, or None if it is not complete yet."""
    if i + 1 >= len(text):
        return None
    kind = text[i + 1]
    if kind == "[":  # CSI: parameters, intermediates, one final byte in @..~
        j = i + 2
        while j < len(text) and not ("@" <= text[j] <= "~"):
            j += 1
        return j + 1 if j < len(text) else None
    if kind == "O":  # SS3: one more byte (F1-F4, keypad)
        return i + 3 if i + 2 < len(text) else None
    return i + 2  # Alt+key


def write_atomic(path: str, content: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(content)
    os.replace(tmp, path)


class Form:
    def __init__(self, out_path: str, draft_path: str) -> None:
        self.out_path = out_path
        self.draft_path = draft_path
        self.chars: list[tuple[str, bool]] = []  # (character, arrived inside a paste)
        self.pasting = False
        self.status = "Paste or type the total, then press Enter"

    def save_draft(self) -> None:
        write_atomic(self.draft_path, "".join(c for c, _ in self.chars))

    def draw(self) -> None:
        value = "".join(c for c, _ in self.chars)
        screen = f"\x1b[H\x1b[2J\x1b[7m {TITLE} \x1b[0m\r\n\x1b[2m{self.status}\x1b[0m\r\n\r\nTotal: {value}"
        os.write(sys.stdout.fileno(), screen.encode("utf-8"))

    def submit(self) -> None:
        value = "".join(c for c, _ in self.chars)
        pasted = sum(1 for _, p in self.chars if p)
        record = {"value": value, "pasted_chars": pasted, "typed_chars": len(self.chars) - pasted}
        write_atomic(self.out_path, json.dumps(record) + "\n")
        self.status = f"[submitted {value!r}]"
        self.chars = []

    def feed(self, text: str) -> tuple[str, bool]:
        """Apply terminal input; returns (unconsumed tail, quit requested)."""
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                end = skip_escape(text, i)
                if end is None:
                    return text[i:], False
                sequence = text[i:end]
                if sequence == PASTE_START:
                    self.pasting = True
                elif sequence == PASTE_END:
                    self.pasting = False
                i = end
                continue
            if ch in "\r\n" and not self.pasting:
                self.submit()
            elif ch in "\x7f\x08":
                if self.chars:
                    self.chars.pop()
            elif ch == CTRL_Q:
                return "", True
            elif ch >= " ":
                self.chars.append((ch, self.pasting))
            i += 1
        return "", False


def main() -> int:
    if len(sys.argv) != 4:
        sys.stderr.write("usage: form.py OUTPUT_JSON READY_FILE DRAFT_FILE\n")
        return 2
    out_path, ready_path, draft_path = sys.argv[1:4]
    fd = sys.stdin.fileno()
    saved_mode = termios.tcgetattr(fd)
    tty.setraw(fd)
    os.write(sys.stdout.fileno(), b"\x1b[?2004h")  # bracketed paste on
    try:
        form = Form(out_path, draft_path)
        form.save_draft()
        form.draw()
        write_atomic(ready_path, f"{os.getpid()}\n")
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        while True:
            data = os.read(fd, 4096)
            if not data:
                break
            pending, quit_now = form.feed(pending + decoder.decode(data))
            if quit_now:
                break
            form.save_draft()
            form.draw()
    finally:
        os.write(sys.stdout.fileno(), b"\x1b[?2004l")
        termios.tcsetattr(fd, termios.TCSADRAIN, saved_mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
