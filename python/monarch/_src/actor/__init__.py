"""The actor layer of monarch: meshes of actors, their shapes and the values they return.

Private: public names are re-exported from ``monarch.actor``.
"""
