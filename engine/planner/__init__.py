"""The planner: which 5D grid (pipe x data x X x Y x Z) to run a model on, ranked by predicted step time with the
memory per GPU, from a cost model of the engine's computation and communication and a machine profile.

cost_model, profiles and plan are plain Python (they import engine.spec, never torch), so `goldfish plan` runs
anywhere; measure (collective timings for a profile of this machine) needs torch.distributed.
"""
