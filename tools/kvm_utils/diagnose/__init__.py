"""`kvm-utils diagnose`: known pathologies of VMs on hybrid hosts -> advice with evidence.

`evidence` (what was seen, per vCPU thread; pure builders) -> `rules` (pure: findings with
the exact ports/MSRs, counts, rates and the setting that fixes each) -> `run` (sources and
renderers).
"""
