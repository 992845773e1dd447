"""The implementation of the ``monarch`` package.

Everything under ``monarch._src`` is private: public modules such as ``monarch`` re-export
the names users may rely on, with ``__all__``.
"""
