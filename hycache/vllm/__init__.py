"""hycache and vLLM: vLLM 0.33's real scheduler as the reference (`reference`)."""
