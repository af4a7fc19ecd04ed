"""coevolve: a generator writes questions, a solver learns to answer them."""

import logging

__version__ = "0.1.0"

# torchao (the optim8bit extra, which transformers imports whenever it is installed) warns at import about CUDA kernels
# a CPU build cannot load and about a deprecated pytree registration: noise on every command, nothing about the run.
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)
