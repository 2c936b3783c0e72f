"""VizDoom scenarios of the Sample Factory paper: scenarios.py (data), doom_env.py (the env), fetch_scenarios.py."""
