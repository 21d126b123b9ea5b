"""Hand-written transcripts for tests and demos.

:func:`dinner_bill` is the paper's motivating example (spec §3.1; paper §2):
an AppWorld-style agent splits a dinner bill among the supervisor's roommates
and sends each a Venmo payment request. The contact search at invocation 8
returns three roommates; the payment requests to Kathryn (invocation 14, which
reuses the ``gmail.com`` domain) and to Troy (invocation 16, which reuses
``troy_solo``) credit that result through TFA reuse edges. The transcript
ends right before invocation 18, whose job is the request to Nancy — the one
address that was never used before and must still be in context.

Seqs are transcript indices (the graph's ``seq``), so a test can name the
contact result directly: :data:`DINNER_BILL_CONTACT_SEQ`.
"""

from __future__ import annotations

import json
from typing import Any

#: The history budget B (tokens) the motivating-example test renders invocation 18 under. The full
#: history is about 5.5K tokens; the user/assistant messages and the omission markers take about
#: 1.9K, leaving about 1.9K for complete results — too little for every result, enough for the
#: contact search only if something argues for it. (With all-MiniLM-L6-v2 the example separates
#: ContextRender from Prune, Semantic Retrieval and CR-Recency+Relevance for B in about 3.6K–3.95K.)
DINNER_BILL_BUDGET = 3800

SYSTEM_PROMPT = """You are an AI assistant that completes day-to-day tasks for your supervisor by calling the APIs of \
the apps they use (amazon, file_system, gmail, phone, simple_note, splitwise, spotify, todoist, venmo).

Rules:
- Look up an app's APIs with api_docs__show_api_descriptions and an API's parameters with \
api_docs__show_api_doc before calling it for the first time.
- The supervisor's account passwords are available through supervisor__show_account_passwords; most app \
APIs need the access_token returned by that app's login API.
- Never guess personal details (names, e-mail addresses, amounts). Read them from the apps.
- Act on the supervisor's behalf only for what the task asks. When the task is done, say so."""

TASK = """My roommates and I had dinner at Osteria Lupa on Thursday and I paid the whole bill. The receipt is \
saved in my file system. Split the total (tip included) equally among the four of us and send each of my \
roommates a Venmo payment request for their share, with the note "Dinner at Osteria Lupa". Don't request \
anything from anyone else."""

_PASSWORDS = {
    "amazon": "R8v!qTz2Lm", "file_system": "n#4GhW7pYs", "gmail": "Zt5@kQ1xVe", "phone": "b9L$mC3uTr",
    "simple_note": "Wq2^fJ8nHa", "splitwise": "P6d&yR0sKv", "spotify": "e3M*tB9wQz", "todoist": "Hc7%xN4jLp",
    "venmo": "Jf1#vS6kDm",
}
_FS_TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJmaWxlX3N5c3RlbStqb3ljZSIsImV4cCI6MTc3OTI4NjQwMH0.tR4hT9wqZc2LmX8vNd3K"
_PHONE_TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwaG9uZSszMTU1MDk2MjI3IiwiZXhwIjoxNzc5Mjg2NDAwfQ.Vb7Qp2sXk9RmE4yTc1Lw"
_VENMO_TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ2ZW5tbytqb3ljZSIsImV4cCI6MTc3OTI4NjQwMH0.Hs8Kd3LpQ7vWz1NcX5rA"
_BILL_PATH = "/home/joyce/documents/receipts/2026-05-14_osteria_lupa.txt"

_APPS = [
    {"name": "api_docs", "description": "Look up the APIs of every app and their documentation."},
    {"name": "supervisor", "description": "Your supervisor's profile, addresses, payment cards, account "
                                          "passwords and the active task."},
    {"name": "amazon", "description": "Online shopping: products, cart, orders, returns and reviews."},
    {"name": "file_system", "description": "Files and directories on the supervisor's computer."},
    {"name": "gmail", "description": "E-mail: inbox, threads, drafts, labels and attachments."},
    {"name": "phone", "description": "Contacts, text messages, voice messages, alarms and the call log."},
    {"name": "simple_note", "description": "Personal notes with tags and pinning."},
    {"name": "splitwise", "description": "Shared expenses and balances within groups of friends."},
    {"name": "spotify", "description": "Music library, playlists, albums and playback."},
    {"name": "todoist", "description": "To-do lists, projects, labels and due dates."},
    {"name": "venmo", "description": "Peer-to-peer payments: send money, request money, manage payment "
                                     "requests, friends, balance and payment cards."},
]

_SUPERVISOR_APIS = [
    {"name": "show_active_task", "description": "Show the task you are currently working on."},
    {"name": "complete_task", "description": "Mark the active task as complete, optionally with an answer."},
    {"name": "show_profile", "description": "Show the supervisor's name, e-mail, phone number and birthday."},
    {"name": "show_addresses", "description": "Show the supervisor's saved home and work addresses."},
    {"name": "show_payment_cards", "description": "Show the supervisor's payment cards."},
    {"name": "show_account_passwords", "description": "Show the supervisor's passwords for every app account."},
]

_FILE_SYSTEM_APIS = [
    {"name": "show_account", "description": "Show your file_system account information."},
    {"name": "login", "description": "Log in with username (e-mail) and password; returns an access_token."},
    {"name": "logout", "description": "Log out and revoke the access_token."},
    {"name": "show_directory", "description": "List the files and sub-directories under a directory_path."},
    {"name": "create_directory", "description": "Create a directory at directory_path."},
    {"name": "delete_directory", "description": "Delete a directory and everything under it."},
    {"name": "show_file", "description": "Show a file's metadata and text content given its file_path."},
    {"name": "create_file", "description": "Create a text file at file_path with the given content."},
    {"name": "update_file", "description": "Replace the content of the file at file_path."},
    {"name": "delete_file", "description": "Delete the file at file_path."},
    {"name": "copy_file", "description": "Copy a file from source_file_path to destination_file_path."},
    {"name": "move_file", "description": "Move a file from source_file_path to destination_file_path."},
    {"name": "compress_directory", "description": "Zip a directory into an archive file."},
    {"name": "decompress_file", "description": "Unzip an archive file into a directory."},
]

_VENMO_APIS = [
    ("show_account", "Show your Venmo account information."),
    ("signup", "Sign up for a new Venmo account."),
    ("delete_account", "Delete your Venmo account."),
    ("update_account_name", "Update your first and last name."),
    ("login", "Log in with username (e-mail) and password; returns an access_token."),
    ("logout", "Log out and revoke the access_token."),
    ("send_verification_code", "Send an account verification code to your e-mail."),
    ("verify_account", "Verify your account with the code sent to your e-mail."),
    ("send_password_reset_code", "Send a password reset code to your e-mail."),
    ("reset_password", "Reset your password with a reset code."),
    ("show_profile", "Show the public profile of a Venmo user by e-mail."),
    ("search_users", "Search Venmo users by name or e-mail."),
    ("show_friends", "List your Venmo friends."),
    ("add_friend", "Add a Venmo user as a friend."),
    ("remove_friend", "Remove a Venmo user from your friends."),
    ("show_venmo_balance", "Show your Venmo balance."),
    ("add_to_venmo_balance", "Move money from a payment card to your Venmo balance."),
    ("withdraw_from_venmo_balance", "Move money from your Venmo balance to a payment card."),
    ("show_bank_transfer_history", "Show transfers between your balance and payment cards."),
    ("download_bank_transfer_receipt", "Download the receipt of a bank transfer."),
    ("show_transactions", "List money you sent or received, with filters."),
    ("show_transaction", "Show one transaction by transaction_id."),
    ("update_transaction", "Update the description of a transaction you sent."),
    ("download_transaction_receipt", "Download the receipt of a transaction."),
    ("create_transaction", "Send money to a Venmo user."),
    ("like_transaction", "Like a transaction."),
    ("unlike_transaction", "Remove your like from a transaction."),
    ("show_transaction_comments", "List the comments on a transaction."),
    ("create_transaction_comment", "Comment on a transaction."),
    ("show_received_payment_requests", "List payment requests others sent you."),
    ("show_sent_payment_requests", "List payment requests you sent, with a status filter."),
    ("show_payment_request", "Show one payment request by payment_request_id."),
    ("create_payment_request", "Request money from a Venmo user."),
    ("delete_payment_request", "Delete a payment request you sent that is still pending."),
    ("approve_payment_request", "Approve and pay a payment request you received."),
    ("deny_payment_request", "Deny a payment request you received."),
    ("remind_payment_request", "Send a reminder for a pending payment request you sent."),
    ("show_social_feed", "Show your friends' recent public transactions."),
    ("show_payment_cards", "List the payment cards linked to your account."),
    ("show_payment_card", "Show one linked payment card."),
    ("delete_payment_card", "Unlink a payment card."),
    ("show_notifications", "List your notifications."),
    ("mark_notification_as_read", "Mark a notification as read."),
]

_CREATE_PAYMENT_REQUEST_DOC = {
    "app_name": "venmo",
    "api_name": "create_payment_request",
    "path": "/payment_requests",
    "method": "POST",
    "description": "Send a request for money to another Venmo user. The request stays pending until the "
                   "recipient approves or denies it, or you delete it.",
    "parameters": [
        {"name": "user_email", "type": "string", "required": True,
         "description": "Email address of the user you are requesting money from."},
        {"name": "amount", "type": "number", "required": True,
         "description": "Amount to request, in USD. Must be positive, with at most 2 decimal places."},
        {"name": "access_token", "type": "string", "required": True,
         "description": "Access token obtained from venmo app login."},
        {"name": "description", "type": "string", "required": False, "default": "",
         "description": "A note shown to the recipient."},
        {"name": "private", "type": "boolean", "required": False, "default": False,
         "description": "Whether the request is hidden from the social feed."},
    ],
    "response_schemas": {
        "success": {"message": "string", "payment_request_id": 1},
        "failure": {"message": "string"},
    },
}

_CONTACTS = [
    {"contact_id": 1268, "first_name": "Kathryn", "last_name": "Maldonado",
     "email": "kathrynmaldonado@gmail.com", "phone_number": "5516882304", "relationships": ["roommate", "friend"],
     "birthday": "1993-07-02", "home_address": "4408 Jefferson Heights Apt 3B, Seattle, WA 98105",
     "work_address": "1201 Fulton Street Suite 400, Seattle, WA 98104", "created_at": "2024-09-01T18:22:05"},
    {"contact_id": 1274, "first_name": "Troy", "last_name": "Solomon",
     "email": "troy_solo@gmail.com", "phone_number": "2063479518", "relationships": ["roommate"],
     "birthday": "1991-11-23", "home_address": "4408 Jefferson Heights Apt 3B, Seattle, WA 98105",
     "work_address": "77 Harbor Loop, Seattle, WA 98121", "created_at": "2024-09-01T18:25:47"},
    {"contact_id": 1301, "first_name": "Nancy", "last_name": "Ritter",
     "email": "nancy.ritter@gmail.com", "phone_number": "4259063372", "relationships": ["roommate", "coworker"],
     "birthday": "1994-02-14", "home_address": "4408 Jefferson Heights Apt 3B, Seattle, WA 98105",
     "work_address": "1201 Fulton Street Suite 400, Seattle, WA 98104", "created_at": "2025-01-12T09:03:31"},
]

_BILL = """OSTERIA LUPA
1518 Pike Place, Seattle, WA 98101
Table 12 · Server: Marco · Guests: 4
Thu 2026-05-14  20:47    Check #30417

2  Burrata with roasted peppers        32.00
1  Fritto misto                         19.50
1  Tagliatelle al ragu                  26.00
1  Cacio e pepe                         23.00
1  Risotto ai funghi                    25.50
1  Branzino al forno                    34.00
1  Bottle Montepulciano d'Abruzzo       48.00
2  Tiramisu                             22.00
4  Espresso                             14.00

Subtotal                               244.00
Sales tax (10.25%)                      25.01
Tip (20% of subtotal)                   48.80
TOTAL                                  317.81

Paid with VISA ending 4417    AUTH 0X8T2Q
Thank you! Grazie mille!"""

_OLD_REQUESTS = [
    {"payment_request_id": 40912, "receiver": {"name": "Aaron Stone", "email": "aaron.stone@outlook.com"},
     "amount": 45.0, "description": "Mariners tickets", "status": "pending", "private": False,
     "created_at": "2026-04-28T10:14:09"},
    {"payment_request_id": 41377, "receiver": {"name": "Grace Whitfield", "email": "grace_w@yahoo.com"},
     "amount": 18.75, "description": "Lyft to the airport", "status": "pending", "private": True,
     "created_at": "2026-05-09T21:40:52"},
]


def _j(obj: Any) -> str:
    """Tool output as AppWorld prints it: indented JSON."""
    return json.dumps(obj, indent=1, ensure_ascii=False)


class _Builder:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._n = 0

    def add(self, message: dict[str, Any]) -> int:
        self.messages.append(message)
        return len(self.messages) - 1

    def step(self, thought: str, *calls: tuple[str, dict[str, Any], str]) -> list[int]:
        """One invocation: the assistant's message with its calls, then each call's result; returns result seqs."""
        ids = []
        tool_calls = []
        for name, args, _ in calls:
            call_id = f"call_{self._n:02d}"
            self._n += 1
            ids.append(call_id)
            tool_calls.append({"id": call_id, "type": "function",
                               "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        self.add({"role": "assistant", "content": thought, "tool_calls": tool_calls})
        return [self.add({"role": "tool", "tool_call_id": cid, "content": out})
                for cid, (_, _, out) in zip(ids, calls, strict=True)]


def dinner_bill(*, reuse: bool = True) -> list[dict[str, Any]]:
    """The motivating example as an OpenAI-format transcript of 18 invocations (0–17).

    With ``reuse=False`` the two payment-request calls write the recipients'
    addresses with another capitalisation (``KathrynMaldonado@GMAIL.COM``,
    ``Troy_Solo@GMAIL.COM``). TFA matching is exact and case-sensitive
    (spec §3), so no value of the contact search matches them and that result
    receives no reuse edges; everything else is unchanged.
    """
    kathryn = "kathrynmaldonado@gmail.com" if reuse else "KathrynMaldonado@GMAIL.COM"
    troy = "troy_solo@gmail.com" if reuse else "Troy_Solo@GMAIL.COM"
    b = _Builder()
    b.add({"role": "system", "content": SYSTEM_PROMPT})
    b.add({"role": "user", "content": TASK})
    # 0
    b.step("I'll start by checking which apps are available.",
           ("api_docs__show_app_descriptions", {}, _j(_APPS)))
    # 1
    b.step("The supervisor app should give me account passwords. Let me see its APIs.",
           ("api_docs__show_api_descriptions", {"app_name": "supervisor"}, _j(_SUPERVISOR_APIS)))
    # 2
    b.step("First, the supervisor's profile, to know their name and login e-mail.",
           ("supervisor__show_profile", {}, _j({
               "first_name": "Joyce", "last_name": "Weaver", "email": "joyce.weaver@outlook.com",
               "phone_number": "3155096227", "birthday": "1992-03-18", "sex": "female"})))
    # 3
    b.step("Now the account passwords, which I need to log in to file_system, phone and venmo.",
           ("supervisor__show_account_passwords", {},
            _j([{"account_name": k, "password": v} for k, v in _PASSWORDS.items()])))
    # 4
    b.step("Let me look at the file_system APIs to find the receipt.",
           ("api_docs__show_api_descriptions", {"app_name": "file_system"}, _j(_FILE_SYSTEM_APIS)))
    # 5
    b.step("I'll log in to file_system to read the receipt, and to phone to find the roommates.",
           ("file_system__login", {"username": "joyce.weaver@outlook.com", "password": _PASSWORDS["file_system"]},
            _j({"access_token": _FS_TOKEN, "token_type": "Bearer"})),
           ("phone__login", {"username": "3155096227", "password": _PASSWORDS["phone"]},
            _j({"access_token": _PHONE_TOKEN, "token_type": "Bearer"})))
    # 6
    b.step("Receipts are probably under documents. Let me list that directory.",
           ("file_system__show_directory",
            {"access_token": _FS_TOKEN, "directory_path": "/home/joyce/documents/receipts/"},
            _j(["/home/joyce/documents/receipts/2026-03-02_comcast_internet.pdf",
                "/home/joyce/documents/receipts/2026-04-11_rei_rain_jacket.txt",
                "/home/joyce/documents/receipts/2026-04-26_safeway_groceries.txt",
                "/home/joyce/documents/receipts/2026-05-03_mariners_tickets.txt",
                _BILL_PATH,
                "/home/joyce/documents/receipts/2026-05-16_shell_gas.txt"])))
    # 7
    b.step("The Osteria Lupa receipt from Thursday 2026-05-14 is the one. Reading it.",
           ("file_system__show_file", {"access_token": _FS_TOKEN, "file_path": _BILL_PATH},
            _j({"file_id": 88213, "path": _BILL_PATH, "size_bytes": 842,
                "created_at": "2026-05-14T21:05:17", "updated_at": "2026-05-14T21:05:17", "content": _BILL})))
    # 8
    b.step("The total with tax and tip is 317.81. Now I need the roommates: I'll search the phone contacts "
           "by relationship.",
           ("phone__search_contacts", {"access_token": _PHONE_TOKEN, "relationship": "roommate"},
            _j(_CONTACTS)))
    # 9
    b.step("Three roommates: Kathryn, Troy and Nancy, so the bill is split four ways: 317.81 / 4 = 79.45 "
           "each (rounded down to the cent). Let me look at the venmo APIs.",
           ("api_docs__show_api_descriptions", {"app_name": "venmo"},
            _j([{"name": n, "description": d} for n, d in _VENMO_APIS])))
    # 10
    b.step("create_payment_request is what I need. Checking its parameters.",
           ("api_docs__show_api_doc", {"app_name": "venmo", "api_name": "create_payment_request"},
            _j(_CREATE_PAYMENT_REQUEST_DOC)))
    # 11
    b.step("It needs the recipient's e-mail and a venmo access_token. Logging in to venmo.",
           ("venmo__login", {"username": "joyce.weaver@outlook.com", "password": _PASSWORDS["file_system"]},
            _j({"message": "Response status code is 401:\nInvalid credentials. Check the username and "
                           "password and try again."})))
    # 12
    b.step("I used the file_system password by mistake. Retrying with the venmo password.",
           ("venmo__login", {"username": "joyce.weaver@outlook.com", "password": _PASSWORDS["venmo"]},
            _j({"access_token": _VENMO_TOKEN, "token_type": "Bearer"})))
    # 13
    b.step("Before sending anything, let me make sure I haven't already requested money for this dinner.",
           ("venmo__show_sent_payment_requests", {"access_token": _VENMO_TOKEN, "status": "pending"},
            _j(_OLD_REQUESTS)))
    # 14
    b.step("No existing requests for the dinner. Requesting Kathryn's share first.",
           ("venmo__create_payment_request",
            {"access_token": _VENMO_TOKEN, "user_email": kathryn, "amount": 79.45,
             "description": "Dinner at Osteria Lupa"},
            _j({"message": "Sent money request.", "payment_request_id": 41896})))
    # 15
    b.step("Let me confirm the request was recorded correctly.",
           ("venmo__show_payment_request", {"access_token": _VENMO_TOKEN, "payment_request_id": 41896},
            _j({"payment_request_id": 41896, "receiver": {"name": "Kathryn Maldonado"}, "amount": 79.45,
                "description": "Dinner at Osteria Lupa", "status": "pending", "private": False,
                "created_at": "2026-05-16T09:12:44", "approved_at": None, "denied_at": None})))
    # 16
    b.step("Kathryn's request is pending as expected. Next, Troy.",
           ("venmo__create_payment_request",
            {"access_token": _VENMO_TOKEN, "user_email": troy, "amount": 79.45,
             "description": "Dinner at Osteria Lupa"},
            _j({"message": "Sent money request.", "payment_request_id": 41897})))
    # 17
    b.step("Checking Troy's request as well.",
           ("venmo__show_payment_request", {"access_token": _VENMO_TOKEN, "payment_request_id": 41897},
            _j({"payment_request_id": 41897, "receiver": {"name": "Troy Solomon"}, "amount": 79.45,
                "description": "Dinner at Osteria Lupa", "status": "pending", "private": False,
                "created_at": "2026-05-16T09:13:20", "approved_at": None, "denied_at": None})))
    # invocation 18 (not in the transcript): request Nancy's share.
    return b.messages


def _contact_seq() -> int:
    msgs = dinner_bill()
    call_id = next(c["id"] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or []
                   if c["function"]["name"] == "phone__search_contacts")
    return next(i for i, m in enumerate(msgs) if m.get("tool_call_id") == call_id)


#: Seq of the contact-search result (invocation 8) in :func:`dinner_bill`.
DINNER_BILL_CONTACT_SEQ = _contact_seq()
