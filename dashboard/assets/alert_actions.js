// gpuwatt: relays a click on an alert's "silence" button or a silence's "expire" button on the
// alerts page into the `alerts-click` store, as {id: <the button's id>, at: <ms>}; the
// dashboard's callback (dashboard/alert_actions.py) acts on it. One listener on the document
// sees the click itself, so a redraw of the page's content at that moment (its live refresh, a
// slow answer) cannot drop it, as it could when the buttons were a pattern-matching callback
// input. Buttons exist only on a dashboard with credentials, whose callback checks them.
//
// A redraw between the press and the release replaces the pressed button with an equal one, and
// the browser then sends no click at all (the press and the release reached two elements).
// Such a release on a button with the pressed one's id is taken as its click.
(function () {
    'use strict';
    var ACTIONS = ['alert-silence', 'silence-expire'];
    var pressed = null;  // {element, id} of the action button under the last press

    function actionOf(target) {
        var button = target && target.closest ? target.closest('button[id^="{"]') : null;
        if (!button) {
            return null;
        }
        var id;
        try {
            id = JSON.parse(button.id);
        } catch (e) {
            return null;
        }
        return id && ACTIONS.indexOf(id.type) >= 0 ? {element: button, id: id} : null;
    }

    function relay(id) {
        var dc = window.dash_clientside;
        if (dc && dc.set_props) {
            dc.set_props('alerts-click', {data: {id: id, at: Date.now()}});
        }
    }

    document.addEventListener('mousedown', function (event) {
        pressed = event.button === 0 ? actionOf(event.target) : null;
    }, true);
    document.addEventListener('mouseup', function (event) {
        var was = pressed;
        pressed = null;
        if (!was || event.button !== 0 || was.element.isConnected) {
            return;  // no action pressed, or the browser's own click follows
        }
        var now = actionOf(event.target);
        if (now && JSON.stringify(now.id) === JSON.stringify(was.id)) {
            relay(now.id);
        }
    }, true);
    document.addEventListener('click', function (event) {
        var action = actionOf(event.target);
        if (action) {
            relay(action.id);
        }
    }, true);
})();
