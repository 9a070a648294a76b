"""Model side: loading, fingerprint, the paged forward pass, sampling, chat template."""
