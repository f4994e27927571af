"""agentpool.local: the whole pool on one machine, and a live replay client.

- :mod:`.prompts`: pure: prompts synthesized from a trace's block ids (exact prefix sharing).
- :mod:`.client`: one streamed chat completion through the router, with branch headers.
- :mod:`.replay`: the closed-loop replay of trace conversations in real time.
- :mod:`.live_report`, :mod:`.run_replay`: the simulator's report format for a live run, the
  progress line.
"""
