"""ALE Notepad: a tiny full-screen text editor that runs inside an xterm (the gui-notepad demo task).

    python3 notepad.py OUTPUT_FILE READY_FILE

It puts its terminal in raw mode, shows what is typed, and understands Enter (new line),
Backspace, Ctrl+S (save the text to OUTPUT_FILE, atomically) and Ctrl+Q (quit). Other escape
sequences (arrow keys, function keys) are ignored. Once the terminal is in raw mode it writes its
pid to READY_FILE, so the task's setup knows keystrokes will no longer be lost.

Runs on the sandbox's own python3 and uses the standard library only.
"""

from __future__ import annotations

import codecs
import os
import sys
import termios
import tty

TITLE = "ALE Notepad"
CTRL_S = "\x13"
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


class Notepad:
    def __init__(self, out_path: str) -> None:
        self.out_path = out_path
        self.lines = [""]
        self.status = "Ctrl+S saves, Ctrl+Q quits"

    def draw(self) -> None:
        body = "\r\n".join(self.lines)
        screen = (
            f"\x1b[H\x1b[2J\x1b[7m {TITLE} \x1b[0m  saves to {self.out_path}\r\n"
            f"\x1b[2m{self.status}\x1b[0m\r\n"
            f"{'-' * 40}\r\n{body}"
        )
        os.write(sys.stdout.fileno(), screen.encode("utf-8"))

    def feed(self, text: str) -> tuple[str, bool]:
        """Apply typed text; returns (unconsumed tail, quit requested)."""
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                end = skip_escape(text, i)
                if end is None:
                    return text[i:], False
                i = end
                continue
            if ch in "\r\n":
                self.lines.append("")
            elif ch in "\x7f\x08":
                if self.lines[-1]:
                    self.lines[-1] = self.lines[-1][:-1]
                elif len(self.lines) > 1:
                    self.lines.pop()
            elif ch == CTRL_S:
                content = "\n".join(self.lines)
                content = content if content.endswith("\n") else content + "\n"
                write_atomic(self.out_path, content)
                self.status = f"[saved {len(content.encode('utf-8'))} bytes]"
            elif ch == CTRL_Q:
                return "", True
            elif ch >= " ":
                self.lines[-1] += ch
            i += 1
        return "", False


def main() -> int:
    if len(sys.argv) != 3:
        sys.stderr.write("usage: notepad.py OUTPUT_FILE READY_FILE\n")
        return 2
    out_path, ready_path = sys.argv[1], sys.argv[2]
    fd = sys.stdin.fileno()
    saved_mode = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        pad = Notepad(out_path)
        pad.draw()
        write_atomic(ready_path, f"{os.getpid()}\n")
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        while True:
            data = os.read(fd, 4096)
            if not data:
                break
            pending, quit_now = pad.feed(pending + decoder.decode(data))
            if quit_now:
                break
            pad.draw()
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved_mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
