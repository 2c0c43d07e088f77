"""What is installed beside the package: the targets registered under the entry-point group
``periodic_manager.targets`` (:mod:`.installed`, read without loading any target's code) and
their write-time rules (:mod:`.task_rules`). Below the schedules, the database and the targets,
so that each of them may ask which targets exist and what they refuse."""
