"""HTTP/2 attacks on the gRPC port: raw frames, the attackers and what the other clients lose."""
