"""HTTP/2 header blocks for the native gRPC server: the requests' decoded, the answers' encoded.

`_request`: a connection's request header blocks decoded (HPACK, `_hpack_decoder`, within a size
limit, with a cache of repeated blocks) and read as gRPC uses them; `_response`: the blocks of
the answers, with the fields every answer repeats indexed. The connection, its streams and calls
import these two modules; they import only `..frames`.
"""
