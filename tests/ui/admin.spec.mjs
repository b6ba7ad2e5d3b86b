// The admin UI end to end in headless Chromium: an admin builds a team, a lead, a member and
// a finance login, issues a token and reads it off the page, spends with it through the
// official OpenAI Python SDK, finds the request in the log and the spend in the report, the
// chart and the CSV, revokes the token and sees the SDK get 401; then finance finds nothing
// to press, and the API refuses finance anyway. Started by run.sh, which provides the env.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, mkdirSync } from "node:fs";
import { chromium } from "playwright-core";

const BASE = process.env.BASE_URL;
const ADMIN_PASSWORD = process.env.ADMIN_PASSWORD;
const OUT = process.env.OUT_DIR;
const PW = "a long and lovely passphrase";
mkdirSync(OUT, { recursive: true });

const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run"];

/** Calls the gateway with the official OpenAI Python SDK; returns {ok, status, text}. */
function sdkChat(token) {
  const script = `
import json, os, sys
from openai import OpenAI, APIStatusError
c = OpenAI(base_url=os.environ["BASE"] + "/v1", api_key=os.environ["TOKEN"], max_retries=0, timeout=10)
try:
    r = c.chat.completions.create(model="gpt-4o-mini", max_tokens=16, messages=[{"role": "user", "content": "hello from the browser test"}])
    print(json.dumps({"ok": True, "status": 200, "text": r.choices[0].message.content}))
except APIStatusError as e:
    print(json.dumps({"ok": False, "status": e.status_code, "text": str(e)}))
`;
  const out = execFileSync("python3", ["-c", script], { env: { ...process.env, BASE, TOKEN: token } });
  return JSON.parse(out.toString());
}

async function shot(page, name) {
  await page.screenshot({ path: `${OUT}/${name}.png`, fullPage: true });
}

/** Every visible form control has a label (or an aria-label). */
async function assertLabelled(page) {
  const unlabelled = await page.evaluate(() =>
    [...document.querySelectorAll("input:not([type=hidden]), select, textarea")]
      .filter((el) => el.labels.length === 0 && !el.getAttribute("aria-label"))
      .map((el) => el.name || el.id));
  assert.deepEqual(unlabelled, [], `unlabelled controls on ${page.url()}`);
}

async function login(page, user, password) {
  await page.goto(`${BASE}/admin/login`);
  await page.getByLabel("Username").fill(user);
  await page.getByLabel("Password").fill(password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL(`${BASE}/admin/`);
}

async function waitForText(page, selector, text, reloadUrl) {
  for (let i = 0; i < 40; i++) {
    const t = await page.locator(selector).innerText().catch(() => "");
    if (t.includes(text)) return t;
    await page.waitForTimeout(250);
    if (reloadUrl) await page.goto(reloadUrl);
  }
  assert.fail(`${selector} never showed ${text}`);
}

test("the admin UI, end to end", async (t) => {
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ARGS });
  const context = await browser.newContext({
    viewport: { width: 1280, height: 900 },
    timezoneId: "Asia/Tokyo",
    acceptDownloads: true,
    permissions: ["clipboard-read", "clipboard-write"],
  });
  const page = await context.newPage();
  page.on("dialog", (d) => d.accept()); // hx-confirm on destructive actions
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  page.setDefaultTimeout(10000);
  let token = "";
  let prefix = "";
  // Steps run in order; after the first failure the rest are skipped (they build on it).
  let broken = false;
  const step = (name, fn) => t.test(name, { skip: broken ? "an earlier step failed" : false }, async (st) => {
    try {
      await fn(st);
    } catch (e) {
      broken = true;
      await shot(page, "failure").catch(() => {});
      throw e;
    }
  });

  try {
    await step("an admin signs in", async () => {
      await login(page, "admin", ADMIN_PASSWORD);
      await page.getByRole("heading", { name: "Dashboard" }).waitFor();
      await assertLabelled(page);
    });

    await step("creates a team", async () => {
      await page.getByRole("link", { name: "Teams" }).click();
      await page.getByLabel("Name").fill("platform");
      await page.getByLabel("Budget (USD, empty = unlimited)").fill("50");
      await page.getByRole("button", { name: "Create team" }).click();
      await page.locator("#teams").getByRole("rowheader", { name: "platform" }).waitFor();
      await page.locator("#flash").getByText("Team platform created.").waitFor();
      await assertLabelled(page);
      await shot(page, "teams");
    });

    await step("creates a lead, a member and a finance login", async () => {
      await page.getByRole("link", { name: "Users" }).click();
      const make = async (name, role, team, password) => {
        const form = page.locator("form[hx-post='/admin/users']");
        await form.getByLabel("Username").fill(name);
        await form.locator("select[name=role]").selectOption(role);
        if (team) await form.locator("select[name=team_id]").selectOption({ label: team });
        if (password) await form.getByLabel(/^Password/).fill(password);
        await form.getByRole("button", { name: "Create user" }).click();
        await page.locator("#flash").getByText(new RegExp(`${name} `)).waitFor();
      };
      await make("lena", "lead", "platform", PW);
      await make("dev1", "member", "platform", null);
      await make("fiona", "finance", null, PW);
      await page.locator("#users").getByRole("rowheader", { name: "dev1" }).waitFor();
      await page.locator("#users").getByRole("rowheader", { name: "lena" }).waitFor();
      await assertLabelled(page);
      await shot(page, "users");
    });

    await step("issues a token and reads it once from the page", async () => {
      await page.getByRole("link", { name: "Tokens" }).click();
      const form = page.locator("form[hx-post='/admin/tokens']");
      await form.locator("select[name=user_id]").selectOption({ label: "dev1 (platform)" });
      await form.getByLabel("Budget (USD, empty = unlimited)").fill("5");
      await form.getByLabel("Requests / min").fill("60");
      await form.getByRole("checkbox", { name: "gpt-4o-mini" }).check();
      await form.getByRole("button", { name: "Issue token" }).click();
      const field = page.locator("#token-text");
      await field.waitFor();
      token = await field.inputValue();
      assert.match(token, /^sk-sl-[0-9A-Za-z]{49}$/);
      prefix = token.slice(6, 14);
      await page.getByRole("button", { name: "Copy" }).click();
      await page.getByRole("button", { name: "Copied" }).waitFor();
      assert.equal(await page.evaluate(() => navigator.clipboard.readText()), token);
      await page.locator("#tokens").getByText(`${prefix}…`).waitFor();
      await assertLabelled(page);
      await shot(page, "token-issued");
      await page.reload();
      assert.equal(await page.locator("#token-text").count(), 0, "the token is shown only once");
      assert.ok(!(await page.content()).includes(token));
    });

    await step("the token works through the official OpenAI Python SDK", () => {
      for (let i = 0; i < 3; i++) {
        const r = sdkChat(token);
        assert.equal(r.ok, true, r.text);
        assert.ok(r.text.length > 0);
      }
    });

    await step("the request shows in the request log", async () => {
      const url = `${BASE}/admin/requests`;
      await page.goto(url);
      const text = await waitForText(page, "#requests", `${prefix}…`, url);
      assert.match(text, /gpt-4o-mini/);
      assert.match(text, /200/);
      // Times are shown in the browser's zone, not as the stored UTC text.
      const times = await page.locator("#requests time").evaluateAll((els) => els.map((e) => [e.textContent, e.getAttribute("datetime")]));
      assert.ok(times.length > 0 && times.every(([shown, utc]) => shown !== utc), JSON.stringify(times));
      await page.getByLabel("Status (e.g. 429 or 4xx)").fill("5xx");
      await page.getByRole("button", { name: "Filter" }).click();
      await page.locator("#requests").getByText("No requests match.").waitFor();
      await shot(page, "requests");
    });

    await step("the spend shows in the report, its chart and its CSV", async () => {
      await page.goto(`${BASE}/admin/reports?by=user`);
      const row = page.locator("#report-table tbody tr", { hasText: "dev1" });
      await row.waitFor();
      const cells = await row.locator("th, td").allInnerTexts();
      assert.equal(cells[0], "dev1");
      assert.equal(cells[1], "3");
      assert.ok(Number(cells[4]) > 0, `spend ${cells[4]}`);
      const heights = await page.locator("svg rect.bar").evaluateAll((rs) => rs.map((r) => Number(r.getAttribute("height"))));
      assert.ok(heights.length >= 28 && heights.some((h) => h > 0), "a bar for today");
      await shot(page, "reports");
      const tableRows = await page.locator("#report-table tbody tr").evaluateAll((trs) =>
        trs.map((tr) => [...tr.querySelectorAll("th, td")].map((c) => c.textContent.trim()).join(",")));
      const [download] = await Promise.all([page.waitForEvent("download"), page.getByRole("link", { name: "Export CSV" }).click()]);
      const csv = readFileSync(await download.path(), "utf8").trim().split("\n");
      assert.equal(csv[0], "user,requests,input_tokens,output_tokens,spend_usd,estimated_usd");
      assert.deepEqual(csv.slice(1), tableRows, "the CSV is exactly the table");
    });

    await step("revoking the token makes the SDK get 401", async () => {
      await page.goto(`${BASE}/admin/tokens`);
      const row = page.locator(`#tokens tr[data-prefix="${prefix}"]`);
      await row.getByRole("button", { name: "Revoke" }).click();
      await page.locator(`#tokens tr[data-prefix="${prefix}"]`).getByText("revoked").waitFor();
      await page.locator("#flash").getByText("revoked").waitFor();
      await shot(page, "tokens");
      let r;
      for (let i = 0; i < 10; i++) {
        r = sdkChat(token);
        if (r.status === 401) break;
        await page.waitForTimeout(200);
      }
      assert.equal(r.status, 401, r.text);
    });

    await step("the other pages render", async () => {
      for (const [path, heading, name] of [["/admin/", "Dashboard", "dashboard"], ["/admin/audit", "Audit log", "audit"],
        ["/admin/upstreams", "Upstream keys", "upstreams"], ["/admin/account", "Your account", "account"]]) {
        await page.goto(BASE + path);
        await page.getByRole("heading", { level: 1, name: heading }).waitFor();
        await assertLabelled(page);
        await shot(page, name);
      }
      await page.goto(`${BASE}/admin/audit`);
      const audit = await page.locator("#audit").innerText();
      for (const action of ["login.ok", "team.create", "user.create", "admin.create", "token.issue", "token.revoke"]) {
        assert.ok(audit.includes(action), `audit shows ${action}`);
      }
      await page.getByRole("button", { name: "Verify the chain" }).click();
      await page.locator("#verify").getByText("Chain intact").waitFor();
      // A phone-sized screen: nothing wider than the screen but scrollable tables.
      await page.setViewportSize({ width: 390, height: 844 });
      for (const [path, name] of [["/admin/", "dashboard-phone"], ["/admin/tokens", "tokens-phone"], ["/admin/reports", "reports-phone"]]) {
        await page.goto(BASE + path);
        const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
        assert.ok(overflow <= 1, `${path} overflows a phone by ${overflow}px`);
        await shot(page, name);
      }
      await page.setViewportSize({ width: 1280, height: 900 });
      // Keyboard: the first Tab lands on the skip link, which jumps to the content.
      await page.goto(`${BASE}/admin/teams`);
      await page.keyboard.press("Tab");
      assert.equal(await page.evaluate(() => document.activeElement.textContent), "Skip to content");
    });

    await step("finance finds nothing to change, and the API refuses anyway", async () => {
      await page.getByRole("button", { name: "Sign out" }).click();
      await page.waitForURL(`${BASE}/admin/login`);
      await login(page, "fiona", PW);
      for (const path of ["/admin/", "/admin/teams", "/admin/users", "/admin/tokens", "/admin/requests", "/admin/reports", "/admin/audit", "/admin/account"]) {
        await page.goto(BASE + path);
        const changers = await page.evaluate(() =>
          [...document.querySelectorAll("[hx-post], [hx-put], [hx-patch], [hx-delete], form[method=post], form[method=POST]")]
            .map((el) => el.getAttribute("hx-post") || el.tagName)
            .filter((p) => p !== "/admin/logout"));
        assert.deepEqual(changers, [], `${path} offers changes to finance`);
        const buttons = await page.getByRole("button").allInnerTexts();
        assert.deepEqual(buttons.filter((b) => !["Sign out", "Filter", "Show", "Verify the chain"].includes(b.trim())), [], `${path}: ${buttons}`);
      }
      await page.goto(`${BASE}/admin/reports`);
      const [download] = await Promise.all([page.waitForEvent("download"), page.getByRole("link", { name: "Export CSV" }).click()]);
      assert.ok(readFileSync(await download.path(), "utf8").startsWith("token,requests"), "finance exports CSV");
      const statuses = await page.evaluate(async () => {
        const csrf = JSON.parse(document.body.getAttribute("hx-headers"))["x-csrf-token"];
        const call = (method, url, body) => fetch(url, { method, headers: { "x-csrf-token": csrf, "content-type": "application/json" }, body: JSON.stringify(body) }).then((r) => r.status);
        return [
          await call("POST", "/admin/api/v1/teams", { name: "finance-team" }),
          await call("POST", "/admin/api/v1/tokens", { user_id: 1, budget_usd: "1" }),
          await call("POST", "/admin/api/v1/tokens/1/rotate", {}),
          await call("POST", "/admin/teams", { name: "finance-team" }),
          await call("POST", "/admin/api/v1/upstreams/mock-a/disable", {}),
        ];
      });
      assert.deepEqual(statuses, [403, 403, 403, 403, 403]);
    });

    await step("no script errors on any page", () => {
      assert.deepEqual(errors.filter((e) => !e.includes("403")), []);
    });
  } finally {
    await browser.close();
  }
});
