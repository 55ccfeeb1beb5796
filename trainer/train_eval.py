"""``python -m trainer.train_eval``: see ``trainer.entry.train_eval_main``."""

from trainer.entry import train_eval_main

if __name__ == "__main__":
    raise SystemExit(train_eval_main())
