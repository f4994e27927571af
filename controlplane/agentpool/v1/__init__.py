"""Generated gRPC stubs (make generate); do not edit."""
