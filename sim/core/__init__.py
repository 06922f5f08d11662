"""The simulation's frame: the step loop, the request table, links, the cluster, the request flow
between stages, faults, and ``assemble`` — the one module that reads the whole scenario.

Stages (``sim/stages``) and policies (``sim/policies``) plug into it; ``sim/run.py`` runs the
clock, and results (``sim/results``) read what the run leaves behind.
"""
