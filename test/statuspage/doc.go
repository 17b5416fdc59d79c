// Package statuspage tests the metadata server's status page the way an
// operator meets it: a real cluster (`shoal mds --http` and three
// `shoal ds`, separate processes over loopback) and the page open in a
// real browser, headless Chromium driven over the DevTools protocol
// (github.com/chromedp/chromedp).
//
// TestStatusPageInBrowser opens the page once and never reloads it. The
// page must show the three data servers in service; a file written with
// `shoal put` must show as bytes held; and after one data server is
// killed with SIGKILL the page's own polling must turn its row to "down"
// and log its leaving. With SHOAL_SCREENSHOT=PATH (relative to the
// repository) it saves a screenshot of the page there; docs/status-page.png
// is made so.
//
// The test needs Debian's chromium package (or SHOAL_CHROMIUM=PATH to a
// Chromium or Chrome binary). Without one it is skipped, unless
// SHOAL_BROWSER=1, as in scripts/test.sh, which makes that a failure.
package statuspage
