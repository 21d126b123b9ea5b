"""Write the price snapshot the package ships: litellm's model cost map, cut to the fields billing reads.

    python scripts/cost_map_snapshot.py            # rewrite contextrender/prices/model_costs.json.gz
    python scripts/cost_map_snapshot.py --check    # exit 1 if the shipped snapshot differs from litellm's map

Billing (``contextrender.billing``) reads prices from ``$CONTEXTRENDER_COST_MAP``, else from the cost map of
an installed litellm, else from this snapshot, so an install without litellm (``[service]``) bills the
same dollars as one with it. Regenerate it whenever the pinned litellm changes (requirements.lock);
tests/core/test_billing_prices.py fails until you do.
"""

from __future__ import annotations

import argparse
import sys

from contextrender import billing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    source = billing.litellm_cost_map_path()
    if source is None:
        print("litellm is not installed: pip install -e '.[llm]'", file=sys.stderr)
        return 2
    version = billing.litellm_version()
    snapshot = billing.snapshot_of(billing._load_cost_map(source), version)
    if args.check:
        same = billing.load_snapshot() == snapshot
        print(f"snapshot {'matches' if same else 'differs from'} litellm {version}'s cost map")
        return 0 if same else 1
    billing.write_snapshot(snapshot)
    print(f"wrote {billing.SNAPSHOT} ({len(snapshot['models'])} models, litellm {version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
