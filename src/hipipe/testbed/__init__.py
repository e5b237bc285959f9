"""The emulated testbed: real AllReduce runs on an emulated multi-dimensional network.

One Linux network namespace per rank, joined by a bridge in a private hub namespace;
on each rank's veth, one htb class per dimension shapes what the rank sends to peers
along that dimension (:mod:`~hipipe.testbed.shaping`). Workers enter their namespace
before they open a socket and run the executor on Gloo (:mod:`~hipipe.testbed.worker`).

Modules, in the order a ``hipipe bench`` uses them: :mod:`~hipipe.testbed.layout`
(names, addresses, parsing; pure), :mod:`~hipipe.testbed.netns` (up/down, state file),
:mod:`~hipipe.testbed.ratecheck` (socket goodput per dimension),
:mod:`~hipipe.testbed.calibrate` (alpha-beta fit, per-op overhead),
:mod:`~hipipe.testbed.launch` (workers and the parent's store),
:mod:`~hipipe.testbed.bench` (the whole measurement and its report).
Everything needs root and iproute2 except ``layout`` and the fits.
"""
