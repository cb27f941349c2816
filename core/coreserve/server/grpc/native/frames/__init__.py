"""HTTP/2 frames for the native gRPC server: the bytes it writes, and the frames a client sends.

`_wire`: frame types, flags, settings and error codes, the frames and header fields the server
writes as bytes, and `ConnectionFault`; `_payloads`: RFC 9113's rules for each frame's payload,
as pure functions; `_reader`: a connection's bytes cut into frames, a turn's share at a time.
The connection imports these modules; they import nothing of the connection (`.._limits` aside).
"""
