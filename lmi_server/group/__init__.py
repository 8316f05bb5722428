"""Multi-node groups at run time: membership between the leader and its workers, the worker node's
process (vLLM's headless ranks and /ping), and how a broken group ends."""
