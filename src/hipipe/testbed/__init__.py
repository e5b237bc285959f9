"""The emulated testbed: real collectives on an emulated multi-dimensional network.

One Linux network namespace per rank, joined by a bridge in a private hub namespace;
on each rank's veth, one htb class per dimension shapes what the rank sends to peers
along that dimension (:mod:`~hipipe.testbed.shaping`). Workers enter their namespace
before they open a socket and run the executor on Gloo (:mod:`~hipipe.testbed.worker`).

Modules, in the order a ``hipipe bench`` uses them: :mod:`~hipipe.testbed.layout`
(names, addresses, parsing; pure), :mod:`~hipipe.testbed.netns` (up/down, state file),
:mod:`~hipipe.testbed.ratecheck` (socket goodput per dimension),
:mod:`~hipipe.testbed.protocol` (typed tasks and events between parent and workers),
:mod:`~hipipe.testbed.launch` (workers and the parent's store),
:mod:`~hipipe.testbed.calibrate` (rank side: ring RS/AG timings, torch),
:mod:`~hipipe.testbed.fit` (alpha-beta fit, per-op overhead; pure),
:mod:`~hipipe.testbed.bench` (the orchestration) filling :mod:`~hipipe.testbed.results`,
which :mod:`hipipe.report.bench` renders. Every time on a rank is the slowest rank's,
measured by :mod:`hipipe.torch.timing`.

The parent never imports torch except to own the rendezvous store; ``layout``,
``protocol``, ``fit`` and ``results`` are pure. Everything else needs root and iproute2.
"""
