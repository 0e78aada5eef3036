r"""report.html for a run or a study directory, written again from its files.

    python launch/report.py runs/demo            # a launch/train.py workdir
    python launch/report.py runs/study           # a launch/study.py workdir
    python launch/report.py W1 W2 ...            # several

A run writes its report.html after every epoch and at its end, and a study at its end, so this
is for a run that was stopped, a directory written before the report existed, or a page to
refresh. The page is one self-contained file (Plotly's offline bundle inlined): open it in any
browser, with no network (`jaxsocial.train.report_page` lists what it shows). Prints each
page's path; bad input is one `error:` line, exit 1.
"""

import json
import sys
from typing import List, Optional

from absl import app

from jaxsocial import cli
from jaxsocial.train import report_page


def main(argv: List[str]) -> Optional[int]:
    workdirs = argv[1:]
    try:
        if not workdirs:
            raise ValueError("give one or more run or study directories: "
                             "python launch/report.py W [W2 ...]")
        paths = [report_page.write(w) for w in workdirs]
    except (ValueError, OSError, KeyError, json.JSONDecodeError) as e:
        sys.stderr.write(f"error: {' '.join(str(e).split())}\n")
        sys.exit(1)
    sys.stdout.write("".join(p + "\n" for p in paths))
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
