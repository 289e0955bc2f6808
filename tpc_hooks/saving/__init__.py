"""How a head or a monitor is kept: the saved format (``config.json`` + safetensors, checked on
load, never unpickled), sharing on the Hugging Face Hub, and the model cards written beside them.

Below the head: it imports no other folder of the package (the cards read the objects they are
given by attribute) and no interpretability toolkit.
"""
