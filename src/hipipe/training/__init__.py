"""Training on hipipe's collectives: a small language model, DDP and FSDP2 runs, the benchmark worker.

- :mod:`.model` -- a decoder-only transformer sized by its gradient bytes, synthetic tokens
- :mod:`.train` -- one run (torch's or hipipe's collectives) with step times and losses
- :mod:`.worker` -- the per-rank entry point torchrun starts (``python -m hipipe.training.worker``)

Importing :mod:`.train` or :mod:`.worker`'s ``run_job`` needs the ``torch`` extra.
"""
