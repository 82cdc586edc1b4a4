"""A local SMTP server (127.0.0.1, no TLS) that records each message and its AUTH PLAIN
credentials: the mail server of the email receiver tests. Go's SMTP client sends PLAIN
credentials without TLS to a localhost server only, which is what this is."""

from __future__ import annotations

import base64
import socketserver
import threading
from dataclasses import dataclass, field

MAX_LINE = 64 * 1024
"""Longest command or message line read (bounded memory)."""


@dataclass
class Mail:
    username: str | None
    password: str | None
    sender: str
    recipients: list[str]
    data: str


@dataclass
class Smtp:
    server: socketserver.ThreadingTCPServer
    mails: list[Mail] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    def snapshot(self) -> list[Mail]:
        with self.lock:
            return list(self.mails)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_smtp() -> Smtp:
    holder: list[Smtp] = []

    class Handler(socketserver.StreamRequestHandler):
        def reply(self, line: str) -> None:
            self.wfile.write(line.encode() + b"\r\n")

        def handle(self) -> None:
            user = password = sender = None
            recipients: list[str] = []
            self.reply("220 localhost ESMTP test")
            while line := self.rfile.readline(MAX_LINE).decode(errors="replace").rstrip("\r\n"):
                verb = line.split(" ", 1)[0].upper()
                if verb in ("EHLO", "HELO"):
                    self.reply("250-localhost")
                    self.reply("250 AUTH PLAIN")
                elif verb == "AUTH":
                    _, user, password = base64.b64decode(line.split()[2]).decode().split("\0")
                    self.reply("235 2.7.0 Authentication successful")
                elif verb == "MAIL":
                    sender = line.partition(":")[2].strip(" <>")
                    self.reply("250 OK")
                elif verb == "RCPT":
                    recipients.append(line.partition(":")[2].strip(" <>"))
                    self.reply("250 OK")
                elif verb == "DATA":
                    self.reply("354 End data with <CR><LF>.<CR><LF>")
                    body = []
                    while (chunk := self.rfile.readline(MAX_LINE).decode(errors="replace")) and (
                        chunk.rstrip("\r\n") != "."
                    ):
                        body.append(chunk)
                    smtp = holder[0]
                    with smtp.lock:
                        smtp.mails.append(
                            Mail(user, password, sender or "", list(recipients), "".join(body))
                        )
                    recipients.clear()
                    self.reply("250 OK")
                elif verb == "QUIT":
                    self.reply("221 Bye")
                    return
                else:
                    self.reply("250 OK")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    smtp = Smtp(server)
    holder.append(smtp)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return smtp
