"""The HTTP TLS flags: coreserve's own (Triton's HTTP has no TLS), named after its --grpc-use-ssl* ones."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coreserve.server.httpd import HttpTls


def add_http_tls_flags(flag: Callable[..., Any], bool_flag: Callable[..., None]) -> None:
    """--http-use-ssl, --http-use-ssl-mutual, --http-server-cert, --http-server-key, --http-root-cert."""
    # fmt: off
    bool_flag("--http-use-ssl", False, "serve HTTP over TLS (https) with --http-server-cert and "
                                       "--http-server-key (default false; not a Triton flag)")
    bool_flag("--http-use-ssl-mutual", False, "serve HTTP over TLS and require client certificates signed "
                                              "by --http-root-cert (default false; not a Triton flag)")
    flag("--http-server-cert", type=Path, default=None, metavar="PEM_FILE",
         help="the HTTP server's certificate (and its chain)")
    flag("--http-server-key", type=Path, default=None, metavar="PEM_FILE",
         help="the HTTP server's private key")
    flag("--http-root-cert", type=Path, default=None, metavar="PEM_FILE",
         help="the certificate that signs HTTP client certificates (mutual TLS)")
    # fmt: on


def check_http_tls_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exits with a usage error when TLS is asked for without the server's certificate and key."""
    wants_tls = args.http_use_ssl or args.http_use_ssl_mutual
    if wants_tls and not (args.http_server_cert and args.http_server_key):
        parser.error("--http-use-ssl needs --http-server-cert and --http-server-key")


def http_tls(args: argparse.Namespace) -> HttpTls | None:
    """The HTTP server's TLS setting from the flags; None serves plain HTTP."""
    if not (args.http_use_ssl or args.http_use_ssl_mutual):
        return None
    from coreserve.server.httpd import HttpTls

    return HttpTls(args.http_server_cert, args.http_server_key, args.http_root_cert, args.http_use_ssl_mutual)
