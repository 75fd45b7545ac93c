"""What the command line computes and prints: `dra-quota check` over files (`check`, and the
`loader` package that reads them), `dra-quota report`'s queries and rows (`showbackreport`), the
plain-text tables (`tables`) and text from user input made safe to print (`printable`). The top
floor: it may import every floor below, and nothing in `quota` imports it.
"""
