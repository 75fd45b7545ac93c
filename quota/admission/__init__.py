"""The decisions for a tenant's object, shared by the webhook and `dra-quota check`: the
admitter (`admitter`), counting the claims that exist (`counting`), our annotations on a claim
(`annotating`), why a claim costs what it costs (`explain`), what is said of devices without a
memory (`memoryless`), the adminAccess policy (`policy`) and one-write admission's token
(`admissiontoken`). Imports `quota.accounting` and below; never `quota.status`, its sibling.
"""
