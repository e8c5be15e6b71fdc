"""libvirt domain XML in two layers (nova's ``config.py`` vs ``designer.py``):

- ``elements``: one small class per XML element, objects <-> XML, no policy;
- ``designer``: the only place that decides what a VM's domain looks like
  (pinning, NUMA, hugepages, locking, devices) from a claim, a spec and host facts.
"""
