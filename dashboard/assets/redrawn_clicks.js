// gpuwatt: a click whose element a redraw replaced between the press and the release still
// counts, on every page.
//
// The pages redraw their content on each live refresh (every minute) and when a slow read
// arrives. A press that lands just before such a redraw and a release just after it reach two
// elements, the old one and its redrawn twin, and the browser then sends no click on either
// (Chromium 156, checked with a mousedown handler that replaces the button): the link is not
// followed, the button not pressed. So the press's clickable element (a link, a button, a
// checkbox or radio button, a summary) is noted with what identifies it (its id, else its tag,
// href and text); if, on the release, that element has left the page and the release is on one
// with the same identity, that one is clicked (element.click(), which Dash's and the browser's
// own handlers take as any click). When the pressed element is still there, the browser's own
// click follows and nothing is added, so an action is never taken twice.
(function () {
    'use strict';
    var CLICKABLE = 'a[href], button, [role="button"], input[type="checkbox"], ' +
        'input[type="radio"], summary';
    var pressed = null;  // {element, key} of the clickable element under the last press

    function clickableOf(target) {
        var element = target && target.closest ? target.closest(CLICKABLE) : null;
        if (!element) {
            return null;
        }
        var key = element.id ? 'id:' + element.id : element.tagName + '|' +
            (element.getAttribute('href') || '') + '|' + element.textContent.trim();
        return {element: element, key: key};
    }

    document.addEventListener('mousedown', function (event) {
        pressed = event.button === 0 ? clickableOf(event.target) : null;
    }, true);
    document.addEventListener('mouseup', function (event) {
        var was = pressed;
        pressed = null;
        if (!was || event.button !== 0 || was.element.isConnected) {
            return;  // nothing clickable pressed, or the browser's own click follows
        }
        var now = clickableOf(event.target);
        if (now && now.key === was.key && !now.element.disabled) {
            now.element.click();
        }
    }, true);
})();
