"""Shared test settings: keep torch to the machine's cores and deterministic."""

import torch

torch.manual_seed(0)
