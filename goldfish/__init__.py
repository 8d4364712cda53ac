"""goldfish: fine-tune causal LMs with the goldfish loss and measure memorization by extraction.

The mask and loss API lives here; the CLI (`goldfish train | eval | compare | mask`) in goldfish.app.cli and the
experiment wiring in goldfish.app.experiment.
"""

from goldfish.collator import GoldfishCollator
from goldfish.loss import GoldfishLoss, goldfish_loss, goldfish_loss_from_token_losses
from goldfish.masks import IGNORE_INDEX, STRATEGIES, causal_targets, drop_mask, format_masked_text

__all__ = ["IGNORE_INDEX", "STRATEGIES", "GoldfishCollator", "GoldfishLoss", "causal_targets", "drop_mask",
           "format_masked_text", "goldfish_loss", "goldfish_loss_from_token_losses"]
