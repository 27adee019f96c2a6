"""The local API: the HTTP server on the Unix socket and the TCP listener, its client, metrics."""
