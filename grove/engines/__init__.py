"""The policy model a run trains and the engine it samples from: loading ``model.path``
(``models.py``), the embedded or vLLM engine and how each step's weights reach it (``policy.py``),
and the vLLM server Grove launches (``vllm_process.py``)."""
