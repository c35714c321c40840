"""Planner back ends: the rule-based planner and the LLM back ends (local transformers, OpenAI HTTP)."""
