"""What serving costs each backend, against the framework in process, and Ray Serve's proxy."""
