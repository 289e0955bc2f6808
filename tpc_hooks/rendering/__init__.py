"""How results look: HTML views of generations, token scores and attributions, the review log's
pages, and the plots (the face: :mod:`tpc_hooks.views`).

Below the head: it imports no other folder of the package (it reads the runs, results and
attributions it is given by attribute) and no interpretability toolkit.
"""
