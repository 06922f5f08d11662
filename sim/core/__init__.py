"""The simulation's frame: the step loop, the request table, links, the cluster and its run loop.

Stages (``sim/stages``) and policies (``sim/policies``) plug into it; results
(``sim/results``) read what it leaves behind.
"""
