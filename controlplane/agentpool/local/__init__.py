"""agentpool.local: the whole pool on one machine, and a live replay client.

- :mod:`.prompts`: pure: prompts synthesized from a trace's block ids (exact prefix sharing).
- :mod:`.client`: one streamed chat completion through the router, with branch headers.
- :mod:`.replay`: the closed-loop replay of trace conversations in real time.
- :mod:`.live_report`, :mod:`.run_replay`: the simulator's report format for a live run, the
  progress line, the split the engines serve.
- :mod:`.pool`: a manifest validated and turned into process specs (Redis, directory, sim engines,
  router, planner) with generated secrets; :mod:`.supervisor` runs specs in process groups;
  :mod:`.up`: ``agentpool up``.
- :mod:`.file_roles`, :mod:`.planner`: the planner's role board as files (the local stand-in for
  pod annotations) and ``python -m agentpool.local.planner``.
- :mod:`.pool_sim`: what a manifest means to the simulator (``agentpool simulate -f``);
  :mod:`.demo`: ``agentpool demo``.
"""
