// Single sign-on end to end in headless Chromium through oidc-provider (a certified OpenID
// provider): alice signs in and lands as admin; her group changes at the provider and she
// is finance at her next sign-in; removed from every group she is refused; the password
// form is not offered and a password posted at the break-glass form is refused for an
// ordinary login. Started by sso.sh, which provides the env.
import { test } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { chromium } from "playwright-core";

const BASE = process.env.BASE_URL;
const IDP = process.env.IDP_URL;
const OUT = process.env.OUT_DIR;
const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run"];

function groups(list) {
  writeFileSync(process.env.ACCOUNTS, JSON.stringify({ alice: list }));
}

/** Through the gateway's SSO button and the provider's login (and consent) pages. */
async function signIn(page) {
  // A live session would send /admin/login on to the dashboard: this is a fresh sign-in.
  await page.context().clearCookies({ name: "sluice_session" });
  await page.goto(`${BASE}/admin/login`);
  await page.click("#sso-login");
  await page.waitForURL((u) => u.href.startsWith(IDP) || u.href.startsWith(BASE), { timeout: 30000 });
  for (let i = 0; i < 3 && page.url().startsWith(IDP); i++) {
    const login = page.locator("input[name=login]");
    if (await login.count()) {
      await login.fill("alice");
      await page.fill("input[name=password]", "any password");
    }
    await Promise.all([page.waitForNavigation({ timeout: 30000 }), page.click("button[type=submit]")]);
  }
  await page.waitForURL((u) => u.href.startsWith(BASE), { timeout: 30000 });
}

async function me(page) {
  return page.evaluate(async () => {
    const r = await fetch("/admin/api/v1/me");
    return { status: r.status, body: r.status === 200 ? await r.json() : null };
  });
}

test("sign-in through the provider, roles from its groups at every sign-in, passwords off", async () => {
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ARGS });
  try {
    const page = await browser.newPage();
    await page.goto(`${BASE}/admin/login`);
    assert.equal(await page.locator("#password-login").count(), 0, "no password form");
    assert.match(await page.textContent("#sso-login"), /Sign in with Test IdP/);

    groups(["llm-admins"]);
    await signIn(page);
    await page.waitForURL(`${BASE}/admin/`, { timeout: 30000 });
    let who = await me(page);
    assert.equal(who.status, 200);
    assert.equal(who.body.role, "admin");
    assert.equal(who.body.username, "alice@example.com");
    await page.screenshot({ path: `${OUT}/sso-admin.png`, fullPage: true });

    // Moved to finance at the provider: finance at the next sign-in.
    groups(["finance"]);
    await signIn(page);
    await page.waitForURL(`${BASE}/admin/`, { timeout: 30000 });
    who = await me(page);
    assert.equal(who.body.role, "finance");

    // Removed from every mapped group: refused with a page saying so, signed out.
    groups(["staff"]);
    await signIn(page);
    assert.match(await page.textContent("#login-error"), /none of your groups/);
    who = await me(page);
    assert.equal(who.status, 401);

    // Password sign-in switched off: an ordinary login's right password is refused.
    await page.goto(`${BASE}/admin/login?break-glass`);
    await page.fill("input[name=username]", "ops");
    await page.fill("input[name=password]", process.env.ADMIN_PASSWORD);
    await Promise.all([page.waitForNavigation(), page.click("#password-login button[type=submit]")]);
    assert.match(await page.textContent("#login-error"), /Password sign-in is switched off/);
    assert.equal((await me(page)).status, 401);
  } finally {
    await browser.close();
  }
});
