"""Co-ReAct: rubrics as step-level collaborators for ReAct search agents (methods spec §4)."""
