"""Language planners: instruction -> grounded sub-goals -> skill policies, with closed-loop replanning.

`base` (SubGoal, World, PlanResult), `skills` (registry + symbolic model), `symbolic` (atoms),
`grounding` (candidate set, embedding grounding, the gate), `validator`, `search` + `backends.rule`
(rule-based planner), `backends.local` / `backends.http` (LLM back ends), `llm_planner` (modes
generate / saycan / constrained), `saycan`, `sim` (worlds and oracle skills for `sims.make` envs),
`learned_skill`, `executor`, `tasks` + `evaluate` (the evaluation suite).
Planners only ever emit sub-goals; skills produce the actions.
"""
