#!/usr/bin/env python3
"""Drives an interactive terminal program (Claude Code's TUI) through a pseudo-terminal.

usage: claude_tui.py --prompt TEXT --expect TEXT [--ready TEXT] [--timeout S] [--raw FILE] -- CMD...

Starts CMD on a 50x140 pty, waits until the screen shows READY (the input box is up), types the
prompt and Enter, waits until the screen shows EXPECT, then types /exit and Enter and waits for
the program to end. Screen text is compared with all whitespace removed: the TUI moves the cursor
instead of writing spaces, so only the characters are kept (escape sequences dropped, a
cursor-forward counts as a space). Prints the screen text seen (whitespace kept as rendered),
then the lines "READY=0|1", "ANSWERED=0|1" and "EXIT=<status>" (-1: had to be killed)."""
import argparse
import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time

ESC = re.compile(rb"\x1b\[(\d*)C|\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")


def text_of(raw):
    def sub(m):
        if m.group(1) is not None:
            return b" " * int(m.group(1) or 1)
        return b""
    return ESC.sub(sub, raw).decode("utf-8", "replace")


def squeeze(s):
    return re.sub(r"\s+", "", s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--expect", required=True)
    ap.add_argument("--ready", default="for shortcuts")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--raw")
    ap.add_argument("cmd", nargs="+")
    a = ap.parse_args()
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(a.cmd[0], a.cmd)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 140, 0, 0))
    raw = bytearray()
    alive = [True]

    def pump(seconds, until=None):
        end = time.time() + seconds
        while time.time() < end and alive[0]:
            if until and until in squeeze(text_of(bytes(raw))):
                return True
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                try:
                    d = os.read(fd, 65536)
                except OSError:
                    d = b""
                if not d:
                    alive[0] = False
                    break
                raw.extend(d)
        return bool(until) and until in squeeze(text_of(bytes(raw)))

    ready = pump(a.timeout / 2, squeeze(a.ready))
    answered = False
    if ready:
        os.write(fd, a.prompt.encode())
        pump(1)
        os.write(fd, b"\r")
        answered = pump(a.timeout, squeeze(a.expect))
    if alive[0]:
        os.write(fd, b"/exit")
        pump(1)
        os.write(fd, b"\r")
        pump(15)
    status = -1
    end = time.time() + 5
    while time.time() < end:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
            break
        time.sleep(0.1)
    if status == -1:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if a.raw:
        with open(a.raw, "wb") as f:
            f.write(bytes(raw))
    sys.stdout.write(text_of(bytes(raw)) + "\n")
    print("READY=%d" % ready)
    print("ANSWERED=%d" % answered)
    print("EXIT=%d" % status)


if __name__ == "__main__":
    main()
