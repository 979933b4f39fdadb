#!/usr/bin/env python3
"""Types one command into a guest's root shell on its serial console socket.

    guest_shell.py SOCKET TIMEOUT_S COMMAND     runs COMMAND, prints its output,
                                                exits with its status
    guest_shell.py SOCKET --send COMMAND        types COMMAND and returns at once
                                                (reboot, a panic: nothing answers)

The shell echoes what is typed and its line editor redraws long lines, so
the output is framed by two markers the echo cannot contain as such (the
begin marker typed with '' inside it, the end marker with a literal $? after
it), each on a line of its own, as hostd/qemu/vm_console.cc frames the e2e tests' commands. Exit 124:
no end marker within TIMEOUT_S.
"""
import re
import socket
import sys
import time
import uuid


def connect(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.settimeout(0.5)
    return s


def read_until(s, seconds, found):
    """Reads the console until found(text) returns non-None or |seconds|
    pass; returns (text, what found returned)."""
    buf = b""
    end = time.time() + seconds
    while time.time() < end:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        if not data:
            break
        buf += data
        text = buf.decode(errors="replace")
        result = found(text)
        if result is not None:
            return text, result
    return buf.decode(errors="replace"), None


def run(path, timeout, command):
    tag = uuid.uuid4().hex[:8]
    begin = "__HVT_BEGIN_%s__" % tag
    # printk output can follow the status on its line (see vm_console.cc).
    done = re.compile(r"__HVT_DONE_%s_(\d+)(?=\r?$|\[ *\d+\.\d+\])" % tag, re.M)
    s = connect(path)
    # Three lines: a README line may end in a comment, which would swallow
    # a marker typed after it on the same line.
    s.sendall(("echo __HVT_BEG''IN_%s__\n%s\necho __HVT_DONE_%s_$?\n" % (tag, command, tag)).encode())

    def framed(text):
        at = text.find(begin)
        m = done.search(text, at) if at >= 0 else None
        return (text[text.find("\n", at) + 1:m.start()], int(m.group(1))) if m else None

    text, result = read_until(s, timeout, framed)
    if result is None:
        sys.stderr.write("guest_shell: no end of `%s` within %ss; console:\n%s\n" %
                         (command, timeout, text[-2000:]))
        return 124
    sys.stdout.write(result[0].replace("\r", ""))
    return result[1]


def send(path, command):
    # QEMU reads the socket only as fast as the guest's UART takes bytes and
    # drops what it has not read when the client goes: stay until the shell
    # has echoed the line's end (then the guest has all of it).
    s = connect(path)
    s.sendall((command + "\n").encode())
    _, echoed = read_until(s, 60, lambda text: True if command[-8:] in text else None)
    if echoed is None:
        sys.stderr.write("guest_shell: the guest did not echo `%s` within 60 s\n" % command)
        return 124
    time.sleep(0.5)
    return 0


def main(argv):
    if len(argv) == 4 and argv[2] == "--send":
        return send(argv[1], argv[3])
    if len(argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    return run(argv[1], float(argv[2]), argv[3])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
