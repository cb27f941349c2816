"""Generated protobuf modules: the model configuration schema and the v2 gRPC service.

Do not edit the `*_pb2*` files by hand: edit `protos/*.proto` at the repository
root and run `python protos/generate.py`.
"""
