"""Labelled prompts: the packaged sources read as data files, splits, phrasing rewrites and intent
flips, translated requests, requests hosted inside benign chats, and the prompt sets built from
them (the face: :mod:`tpc_hooks.data`).

Imports only the head's errors; knows no model.
"""
