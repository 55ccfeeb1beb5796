"""``python -m trainer.pooled_eval``: see ``trainer.entry.pooled_eval_main``."""

from trainer.entry import pooled_eval_main

if __name__ == "__main__":
    raise SystemExit(pooled_eval_main())
