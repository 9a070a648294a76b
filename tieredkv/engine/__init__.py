"""The engine: request state, scheduler, step loop and metrics."""
